# The Space image (`durable-space`): spacesd with Python 3, bash, coreutils, findutils and
# procps, and the programs agents run in real sessions (git, make, a C compiler, tar, gzip:
# the bundled workloads, scenarios/workloads), run by a non-root user `cua` whose workspace
# is /home/cua/work. PID 1 is spacesd's
# supervisor, which starts the daemon again when it dies: killing the daemon (the supervisor
# restarts it, commands keep running) and restarting the container (every process gone, the
# disk kept) are different faults.
#
# Build with ci/build-images.sh (or `chaos image build`): it passes BASE when
# debian:bookworm-slim cannot be pulled (an equivalent made by ci/build-rootfs.sh).
# Layers go from least to most often changed, so a change to spacesd rebuilds only the COPY.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 bash coreutils findutils procps git make gcc libc6-dev tar gzip \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# The workspace and the daemon's state (outside the workspace) live in the container's own
# writable layer: kept by a restart, removed with the container. Not volumes: two mounts
# would put them on different filesystems, and spacesd renames its temp files (in the state
# directory) into the workspace.
RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash cua \
 && install -d -o cua -g cua -m 0755 /home/cua/work /var/lib/spacesd

COPY spacesd/ /opt/spacesd/spacesd/
RUN python3 -m compileall -q /opt/spacesd

ENV PYTHONPATH=/opt/spacesd \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/cua
USER cua
WORKDIR /home/cua/work
EXPOSE 7777
LABEL org.opencontainers.image.title="durable-space" \
      org.opencontainers.image.description="A durable agent Space: spacesd under a supervisor"

# The token comes from SPACESD_TOKEN (set by the backend at `docker create`).
ENTRYPOINT ["python3", "-m", "spacesd.supervisor", "run", \
            "--pid-file", "/var/lib/spacesd/daemon.pid", "--port-file", "/var/lib/spacesd/port", "--"]
CMD ["--root", "/home/cua/work", "--state", "/var/lib/spacesd", \
     "--host", "0.0.0.0", "--port", "7777", "--token-env", "SPACESD_TOKEN"]
