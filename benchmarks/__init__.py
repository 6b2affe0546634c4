"""Side-by-side benchmarks of gpupool against PyTorch's own CUDA allocators.

    python -m benchmarks                         # everything: about 10 minutes on an H100
    python -m benchmarks --quick                 # a smoke run: small sizes, one repetition
    python -m benchmarks --only lora,churn --modes native,gpupool --reps 5 --json results.json

Each run is a subprocess (a process picks its allocator once) in one of the
modes of :mod:`benchmarks.modes`; modes are interleaved and every
(workload, mode) pair is repeated ``--reps`` times, so that the table shows the
median and the spread (min..max), and each mode's ratio to the best of
PyTorch's modes. The workloads (:mod:`benchmarks.workloads`) are a LoRA
fine-tune and batched generation of a Qwen2-shaped model (the scripts in
``examples/``), an allocation churn micro-benchmark (:mod:`benchmarks.churn`)
and a loop whose tensor shapes grow and shrink (:mod:`benchmarks.frag`).

Memory is reported twice: the peaks the allocator in use counts (allocated:
bytes handed to tensors; reserved: bytes the allocator holds from the
device), and the peak device memory of the process as NVML sees it
(:mod:`benchmarks.nvml`), which also counts the CUDA context and anything the
allocator does not account for.
"""
