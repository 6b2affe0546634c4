"""Side-by-side benchmarks of gpupool against PyTorch's own CUDA allocators.

    python -m benchmarks                         # everything: 580 s on an H100 (2026-11-23)
    python -m benchmarks --quick --reps 1        # a smoke run: small sizes, one repetition
    python -m benchmarks --only lora,churn --modes native,gpupool --reps 5 --json results.json
    python -m benchmarks --only soak,graph --modes gpupool --reps 1   # gpupool only, not in the default run
    python -m benchmarks --only finetune --modes native,expandable,async,gpupool   # not in the default run
    python -m benchmarks --only peer             # two GPUs of one process: the first copy between them, copy rates

Each run is a process of its own (a process picks its allocator once),
forked from a zygote per mode that has imported torch and transformers
(:mod:`benchmarks.zygote`; ``--fresh`` starts a new interpreter instead), in
one of the modes of :mod:`benchmarks.modes`; modes are interleaved and every
(workload, mode) pair is repeated ``--reps`` times, so that the table shows the
median and the spread (min..max), and each mode's ratio to the best of
PyTorch's modes. The workloads (:mod:`benchmarks.workloads`) are a LoRA
fine-tune and batched generation of a Qwen2-shaped model (the scripts in
``examples/``), an allocation churn micro-benchmark (:mod:`benchmarks.churn`)
and a loop whose tensor shapes grow and shrink (:mod:`benchmarks.frag`).
``--only finetune`` runs the full fine-tune's mixed-precision recipe three
ways (``finetune_base``: every mode; ``finetune_offload``: gpupool with the
optimizer's state offloaded; ``finetune_cap``: at a cap every PyTorch mode
runs out of memory at, which is a result there, not a failure) and checks
that the offloaded runs keep 0.85x the tokens/s of gpupool without offload.

Memory is reported twice: the peaks the allocator in use counts (allocated:
bytes handed to tensors; reserved: bytes the allocator holds from the
device), and the peak device memory of the process as NVML sees it
(:mod:`benchmarks.nvml`), which also counts the CUDA context and anything the
allocator does not account for.
"""
