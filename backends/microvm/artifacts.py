"""What a microVM Space boots: Debian's cloud kernel, an initramfs that loads its virtio
drivers, and a base disk (the project's Debian root filesystem with spacesd), built once and
cached by a hash of everything that goes into them.

- kernel: the package ``linux-image-cloud-amd64`` depends on, fetched with ``apt-get
  download`` and unpacked with ``dpkg-deb -x`` (its virtio drivers are modules);
- initramfs: ``busybox`` from ``busybox-static``, the modules virtio_ring, virtio,
  virtio_mmio, virtio_blk, failover, net_failover, virtio_net and virtio_console (in that
  order: each needs the ones before it) and ``guest/initramfs-init``;
- base disk: ``ci/build-rootfs.sh`` with python3 and procps (the same debootstrap'd root
  filesystem as the Docker image's base), plus spacesd, busybox and ``guest/cua-init``,
  made into ext4 with ``mkfs.ext4 -d`` and converted to qcow2. Each Space's disk is a qcow2
  overlay on it.

The cache (``CUA_MICROVM_CACHE``, default ``/var/cache/durable-spaces/microvm``) holds one
directory per recipe hash, written under a temporary name and renamed when complete. A
first build needs root (debootstrap, device nodes) and Debian's package mirror; later ones
need neither. ``python -m backends.microvm build`` builds ahead of time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.sources import SPACESD, tree_hash
from durable.errors import SpaceError

GUEST = Path(__file__).with_name("guest")
ROOT = Path(__file__).resolve().parents[2]
ROOTFS_SCRIPT = ROOT / "ci" / "build-rootfs.sh"
KERNEL_META = "linux-image-cloud-amd64"
MODULES = ("kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko",
           "kernel/drivers/virtio/virtio_mmio.ko", "kernel/drivers/block/virtio_blk.ko",
           "kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko",
           "kernel/drivers/net/virtio_net.ko", "kernel/drivers/char/virtio_console.ko")
GUEST_PACKAGES = "python3,procps"
DISK_SIZE = "2G"
CACHE_ENV = "CUA_MICROVM_CACHE"
BUSYBOX = "/bin/busybox"


class ArtifactsUnavailable(SpaceError):
    """The guest cannot be built here; the message says what is missing."""


@dataclass(frozen=True)
class Artifacts:
    kernel: Path
    initrd: Path
    disk: Path
    #: The recipe hash: every Space booted from these records it.
    key: str


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "/var/cache/durable-spaces/microvm")


def _run(argv: list[str], **kw: Any) -> str:
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True, **kw)
    except FileNotFoundError:
        raise ArtifactsUnavailable(f"{argv[0]} is missing: install Debian's packages "
                                   "qemu-system-x86, qemu-utils, busybox-static, debootstrap "
                                   "and e2fsprogs") from None
    except subprocess.CalledProcessError as exc:
        raise ArtifactsUnavailable(f"{' '.join(argv[:3])} failed ({exc.returncode}): "
                                   f"{(exc.stderr or exc.stdout or '').strip()[-600:]}") from None
    return str(done.stdout)


def kernel_package() -> str:
    """The kernel package the cloud meta-package names now (e.g.
    ``linux-image-6.1.0-57-cloud-amd64``)."""
    for line in _run(["apt-cache", "depends", KERNEL_META]).splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and name.startswith("linux-image-"):
            return name
    raise ArtifactsUnavailable(f"apt-cache names no kernel for {KERNEL_META}; run apt-get "
                               "update, or set up Debian's package sources")


def recipe(kernel: str) -> str:
    """The hash of everything a build puts in: the kernel, this file, the guest's scripts,
    spacesd, the root filesystem's recipe and its packages."""
    rootfs = _run(["bash", str(ROOTFS_SCRIPT), "--recipe"],
                  env={**os.environ, "EXTRA_PACKAGES": GUEST_PACKAGES}).strip()
    h = hashlib.sha256("\0".join([kernel, rootfs, GUEST_PACKAGES, DISK_SIZE]).encode())
    h.update(tree_hash([Path(__file__), GUEST, SPACESD]).encode())
    return h.hexdigest()[:16]


def ensure(say: Callable[[str], None] = lambda _line: None) -> Artifacts:
    """The cached artifacts of the current recipe, built first if missing."""
    kernel = kernel_package()
    key = recipe(kernel)
    out = cache_dir() / key
    found = _complete(out, key)
    if found is not None:
        return found
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others wait
        found = _complete(out, key)
        if found is not None:
            return found
        if os.geteuid() != 0:
            raise ArtifactsUnavailable(
                f"the microVM guest ({key}) is not built yet and building it needs root "
                "(debootstrap): run `sudo python -m backends.microvm build` once")
        work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=cache_dir()))
        try:
            _build(work, kernel, say)
            os.rename(work, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        prune()
    found = _complete(out, key)
    assert found is not None
    return found


def _complete(out: Path, key: str) -> Artifacts | None:
    paths = Artifacts(out / "vmlinuz", out / "initrd.gz", out / "base.qcow2", key)
    if all(p.is_file() for p in (paths.kernel, paths.initrd, paths.disk)):
        os.utime(out)  # used now: pruning keeps it
        return paths
    return None


#: Recipes kept in the cache (the most recently used), and how recently used one must be
#: to be kept anyway (a Space booted from it may boot again).
KEEP_RECIPES = 6
KEEP_USED_WITHIN_S = 3600.0


def prune() -> list[str]:
    """Remove the cached builds of old recipes (every spacesd change makes a new one);
    the removed keys."""
    import time

    builds = sorted((p for p in cache_dir().iterdir()
                     if p.is_dir() and not p.name.startswith(".")),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in builds[KEEP_RECIPES:]:
        if time.time() - old.stat().st_mtime > KEEP_USED_WITHIN_S:
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old.name)
    return removed


def _build(work: Path, kernel: str, say: Callable[[str], None]) -> None:
    say(f"microvm: fetching {kernel}")
    _run(["apt-get", "download", kernel], cwd=work)
    deb = next(work.glob(f"{kernel}_*.deb"))
    unpacked = work / "kernel"
    _run(["dpkg-deb", "-x", str(deb), str(unpacked)])
    deb.unlink()
    (vmlinuz,) = (unpacked / "boot").glob("vmlinuz-*")
    shutil.copy(vmlinuz, work / "vmlinuz")
    (modules,) = (unpacked / "lib" / "modules").iterdir()
    say("microvm: initramfs")
    _initramfs(work / "initrd.gz", modules)
    shutil.rmtree(unpacked)
    say("microvm: root filesystem (debootstrap, cached)")
    tarball = _run(["bash", str(ROOTFS_SCRIPT)],
                   env={**os.environ, "EXTRA_PACKAGES": GUEST_PACKAGES}).strip().splitlines()[-1]
    say("microvm: base disk")
    _disk(work, Path(tarball))


def _initramfs(dest: Path, modules: Path) -> None:
    tree = dest.parent / "initramfs"
    (tree / "bin").mkdir(parents=True)
    (tree / "lib" / "modules").mkdir(parents=True)
    _static_busybox(tree / "bin" / "busybox")
    for rel in MODULES:
        shutil.copy(modules / rel, tree / "lib" / "modules" / Path(rel).name)
    shutil.copy(GUEST / "initramfs-init", tree / "init")
    os.chmod(tree / "init", 0o755)
    names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    cpio = subprocess.run([BUSYBOX, "cpio", "-o", "-H", "newc"], cwd=tree, check=True,
                          input=("\n".join([".", *names]) + "\n").encode(),
                          capture_output=True).stdout
    import gzip

    dest.write_bytes(gzip.compress(cpio, compresslevel=6))
    shutil.rmtree(tree)


def _static_busybox(dest: Path) -> None:
    if not os.path.exists(BUSYBOX):
        raise ArtifactsUnavailable("no /bin/busybox: apt-get install busybox-static")
    if _has_interp(BUSYBOX):
        raise ArtifactsUnavailable("/bin/busybox is linked dynamically (Debian's busybox "
                                   "package): apt-get install busybox-static")
    shutil.copy(BUSYBOX, dest)


def _has_interp(path: str) -> bool:
    """Whether the executable at ``path`` names a dynamic loader (its PT_INTERP path sits
    in the first page of the file)."""
    with open(path, "rb") as f:
        return b"/lib64/ld-linux" in f.read(4096)


def _disk(work: Path, tarball: Path) -> None:
    root = work / "root"
    root.mkdir()
    with tarfile.open(tarball) as tar:
        tar.extractall(root, numeric_owner=True, filter="fully_trusted")
    shutil.copytree(SPACESD, root / "opt" / "spacesd" / "spacesd",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "opt" / "cua").mkdir(parents=True)
    _static_busybox(root / "opt" / "cua" / "busybox")
    shutil.copy(GUEST / "cua-init", root / "sbin" / "cua-init")
    os.chmod(root / "sbin" / "cua-init", 0o755)
    for d in ("var/lib/spacesd", "home/cua/work"):
        (root / d).mkdir(parents=True, exist_ok=True)
    raw = work / "disk.raw"
    _run(["mkfs.ext4", "-q", "-F", "-L", "cua-root", "-d", str(root), str(raw), DISK_SIZE])
    shutil.rmtree(root)
    _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "base.qcow2")])
    raw.unlink()
