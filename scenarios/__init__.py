"""Scripted agents (deterministic plans of tool calls from a seed), users' workloads and
campaign presets."""

from .plan import Scenario, generate, workload_scenario
from .preset import Preset, PresetError, load
from .steps import Expected, Step
from .workload import Workload, WorkloadError, named
from .workspace_model import WorkspaceModel


def scenario_of(preset: str, seed: int, *, steps: int | None = None,
                keep: tuple[int, ...] | None = None, simple: tuple[int, ...] = ()) -> Scenario:
    """The agent of a run: a workload's calls (``workload:<path>``, ``real``) or a preset's
    steps drawn from ``seed`` (``steps`` overrides a preset's count), shrunk to ``keep``
    with ``simple`` simplified (``Scenario.keep``)."""
    workload = named(preset, seed)
    if workload is not None:
        return workload_scenario(workload, seed).keep(keep, simple)
    return generate(seed, load(preset), steps=steps, keep=keep, simple=simple)


__all__ = ["Expected", "Preset", "PresetError", "Scenario", "Step", "Workload",
           "WorkloadError", "WorkspaceModel", "generate", "load", "scenario_of"]
