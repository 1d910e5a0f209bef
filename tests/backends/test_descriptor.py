"""Backends as campaigns see them (``backends.descriptor``, mapped by
``chaos.space_providers``): each says its abilities, the campaign asks instead of comparing
names, and a backend that cannot run here says what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.errors import BackendUnavailable
from chaos.space_providers import (
    BACKEND_DESCRIPTORS,
    BACKENDS,
    backend,
    make_spaces,
    probe_backend,
    snapshot_kind,
)


def test_every_backend_is_found_by_its_name_and_an_unknown_one_is_refused() -> None:
    assert BACKENDS == ("local", "docker", "microvm", "virtual")
    assert all(backend(name).name == name for name in BACKENDS)
    with pytest.raises(BackendUnavailable, match=r"unknown backend 'nope'; use one of"):
        backend("nope")


def test_the_abilities_each_backend_declares() -> None:
    machines = {n for n, b in BACKEND_DESCRIPTORS.items() if b.machines}
    in_run_dirs = {n for n, b in BACKEND_DESCRIPTORS.items() if b.spaces_in_run_dir}
    assert machines == {"microvm"} and in_run_dirs == {"local", "microvm"}
    assert not backend("virtual").spaces and backend("docker").shared_failpoints
    assert snapshot_kind("microvm", "auto") == "machine"
    assert snapshot_kind("local", "auto") == "workspace"
    with pytest.raises(BackendUnavailable, match="whole machines"):
        snapshot_kind("docker", "machine")


def test_a_backend_without_an_ability_refuses_it_before_making_anything(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match=r"docker backend cannot give its Spaces' "
                       r"\['state'\] a disk of their own; use a backend that can "
                       r"\(\['local'\]\)"):
        make_spaces("docker", tmp_path, disks={"state": 1 << 20})
    with pytest.raises(BackendUnavailable, match="has no Spaces"):
        make_spaces("virtual", tmp_path)
    probe_backend("local", tmp_path)  # can run here: no error


def test_the_docker_descriptor_loads_without_the_docker_sdk() -> None:
    """The registry imports every descriptor; a machine without the docker extra must
    still run local campaigns."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['docker'] = None\n"
         "import chaos.space_providers as p\n"
         "try:\n    p.make_spaces('docker', __import__('pathlib').Path('.'))\n"
         "except p.BackendUnavailable as e:\n    print(e)"],
        capture_output=True, text=True, timeout=120, check=True)
    assert "the docker backend is not installed here" in done.stdout, done.stdout
