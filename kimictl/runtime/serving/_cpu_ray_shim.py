"""kimictl's fix-ups that let vLLM 0.32's CPU build run its Ray executor (RayExecutorV2).

Copied by `kimictl setup cpu-runtime --ray` into the CPU runtime's site-packages and imported
from a .pth file at every start of that Python (the API server, the engine core, and the Ray
actors each node's raylet starts), never by kimictl itself. It only hooks two vLLM modules and
changes them after they load; KIMICTL_CPU_RAY_SHIM=0 turns it off.

What vLLM CPU 0.32 lacks, and the fix-up:
1. CpuPlatform.ray_device_key is "" ("current platform cpu does not support ray"): "CPU", so
   the placement group asks one CPU per rank ({"CPU": 1} bundles).
2. the actors are created with resources={key: 1}; Ray refuses "CPU" there ("Use the 'num_cpus'
   ... keyword"): no extra resources; the placement-group bundle already holds the CPU.
3. each actor reads get_accelerator_ids()[key], which has no "CPU" entry: device 0 on its node
   (a CPU rank has no device to pick).
A vLLM whose CPU platform names a Ray device itself is left as it is.
"""

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_TARGETS = ("vllm.platforms.cpu", "vllm.v1.executor.ray_executor_v2")


def _patch(name: str, module: ModuleType) -> None:
    if name == "vllm.platforms.cpu":
        if not module.CpuPlatform.ray_device_key:
            module.CpuPlatform.ray_device_key = "CPU"
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or current_platform.ray_device_key != "CPU":
        return
    import ray

    def no_extra_resources() -> dict[str, Any]:
        return {"num_gpus": 0}

    def node_and_device(self: Any) -> tuple[str, list[int]]:
        return ray.get_runtime_context().get_node_id(), [0]

    module.RayExecutorV2._get_actor_resource_kwargs = staticmethod(no_extra_resources)
    module.RayWorkerProc.get_node_and_physical_gpu_ids = node_and_device


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _patch(name, module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("KIMICTL_CPU_RAY_SHIM", "1") != "0":
    sys.meta_path.insert(0, _AfterImport())
