"""Peak device memory of a benchmark process, as NVML sees it.

A background thread of the harness samples every 20 ms (``--nvml-interval``), from the launch of
the worker to its exit:

- ``process``: the worker's own usage (``nvmlDeviceGetComputeRunningProcesses``,
  ``usedGpuMemory`` of its pid). Preferred: other processes on the GPU do not
  disturb it. It includes the worker's CUDA context (about 0.5 GiB).
- ``device``: the device's used memory (``nvmlDeviceGetMemoryInfo``) minus what
  was used just before the launch. The fallback where NVML cannot show the
  worker's pid (a container's pid namespace, MIG, missing permissions); it
  also counts whatever other processes allocate meanwhile.

Each result names the method it used. NVML comes from the ``nvidia-ml-py``
package (module ``pynvml``); without it the figures are simply absent."""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional

INTERVAL_S = 0.02


class Nvml:
    """NVML, initialised once, on the GPU that is the workers' CUDA device 0."""

    def __init__(self, uuid: Optional[str], index: int = 0) -> None:
        """Open NVML on the device of this UUID (as torch prints it, with or
        without the 'GPU-' prefix), or on NVML's device `index` when it is None.
        Never raises: `note` says why `available` is False."""
        self.available = False
        self.note = ""
        self._handle: Any = None
        try:
            import pynvml
        except ImportError:
            self.note = "NVML figures need the nvidia-ml-py package (module pynvml)"
            return
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            if uuid:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as e:
            self.note = f"NVML unavailable: {e}"
            return
        self.available = True

    @property
    def error(self) -> type:
        """The exception class NVML raises."""
        return self._nvml.NVMLError

    def used(self) -> int:
        """Bytes in use on the device, all processes together."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def process_used(self, pid: int) -> Optional[int]:
        """Bytes the process `pid` uses on the device; None where NVML does not say."""
        for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None

    def close(self) -> None:
        """Shut NVML down."""
        if self.available:
            self._nvml.nvmlShutdown()
            self.available = False


class PeakSampler:
    """Samples a worker's device memory in a thread until stop(): see the module's doc."""

    def __init__(self, nvml: Nvml, interval: float = INTERVAL_S) -> None:
        """Record the baseline (device memory in use now); call before launching the worker."""
        self._nvml = nvml
        self._interval = interval
        self._baseline = nvml.used()
        self._device_peak = self._baseline
        self._process_peak: Optional[int] = None
        self._error = ""
        self._pid = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)

    def start(self, pid: int) -> None:
        """Watch the process `pid` (just launched)."""
        self._pid = pid
        self._thread.start()

    def _sample(self) -> None:
        self._device_peak = max(self._device_peak, self._nvml.used())
        mine = self._nvml.process_used(self._pid)
        if mine is not None:
            self._process_peak = mine if self._process_peak is None else max(self._process_peak, mine)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._sample()
                self._stop.wait(self._interval)
        except self._nvml.error as e:
            self._error = f"NVML sampling stopped: {e}"

    def stop(self) -> Dict[str, Any]:
        """Stop sampling; returns {"nvml_peak": bytes, "nvml_method": "process" | "device"}
        and "nvml_error" if a sample failed (the peak then covers the samples before it)."""
        self._stop.set()
        self._thread.join()
        if self._process_peak is not None:
            out: Dict[str, Any] = {"nvml_peak": self._process_peak, "nvml_method": "process"}
        else:
            out = {"nvml_peak": self._device_peak - self._baseline, "nvml_method": "device"}
        if self._error:
            out["nvml_error"] = self._error
        return out
