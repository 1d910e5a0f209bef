"""Scripted agents (deterministic plans of tool calls from a seed) and campaign presets."""

from .plan import Scenario, generate
from .preset import Preset, PresetError, load
from .steps import Expected, Step
from .workspace_model import WorkspaceModel

__all__ = ["Expected", "Preset", "PresetError", "Scenario", "Step", "WorkspaceModel",
           "generate", "load"]
