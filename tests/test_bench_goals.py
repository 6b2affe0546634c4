"""The benchmark harness's goal lists (no GPU: what the harness adds up)."""
from __future__ import annotations

from benchmarks.__main__ import cold_goals, graph_goals, offload_goals, soak_goals


def test_every_goal_list_is_a_list_without_runs() -> None:
    # The harness adds them up (graph_goals once returned None: every run's
    # summary failed with a TypeError).
    for goals in (offload_goals, cold_goals, soak_goals, graph_goals):
        assert goals([]) == []
