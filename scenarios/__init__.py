"""Scripted agents (deterministic plans of tool calls from a seed) and campaign presets."""

from .plan import Scenario, Step, WorkspaceModel, generate
from .preset import Preset, PresetError, load

__all__ = ["Preset", "PresetError", "Scenario", "Step", "WorkspaceModel", "generate", "load"]
