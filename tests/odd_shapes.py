"""What real programs leave in a workspace, made by real bash: the shapes the workspace
state contract keeps (empty and deep directories, FIFOs, absolute, dangling and looping
links, hardlinks, sparse files, set mtimes, set-id and sticky bits, mode 000, odd names).

``ODD_SHAPES`` is one bash script (run in the workspace root); ``MUTATE`` changes every one
of them, so a restore or a revert that keeps them has something to bring back.
"""

from __future__ import annotations

ODD_SHAPES = r"""
set -e
mkdir -p empty deep/a/b/c/d .git/refs/heads .git/objects/pack
printf 'ref: refs/heads/main\n' > .git/HEAD
mkfifo pipe
ln -s /usr/bin/python3 py
ln -s missing/target dangling
ln -s loop2 loop1 && ln -s loop1 loop2
printf shared > h1 && ln h1 h2 && mkdir -p sub && ln h1 sub/h3
printf head > sparse && truncate -s 1M sparse
printf 'dated\n' > dated && touch -d '2001-02-03 04:05:06.123456789' dated
touch -h -d '1999-12-31 23:59:59' py
printf 'x\n' > suid && chmod 4755 suid
mkdir shared && chmod 1777 shared
printf 'secret\n' > locked && chmod 000 locked
mkdir closed && chmod 000 closed
printf 'w\n' > 'C:\temp\report.txt'
printf 'n\n' > $'new\nline'
printf 'd\n' > ./-rf
printf 'l\n' > $'latin1-caf\xe9'
printf 'e\n' > "$(printf 'n%.0s' $(seq 1 255))"
touch -d '2002-02-02' deep/a/b/c/d deep
"""

#: Changes every shape of ``ODD_SHAPES`` (and adds a socket-free stray file).
MUTATE = r"""
set -e
rmdir empty
rm -rf deep .git/refs
rm pipe && printf 'not a fifo\n' > pipe
rm py dangling loop1
rm h2 && printf shared > h2
printf more >> sub/h3
cat sparse > sparse.tmp && mv sparse.tmp sparse
touch dated
chmod 755 suid shared
chmod 644 locked
chmod 755 closed
rm 'C:\temp\report.txt' $'new\nline' ./-rf $'latin1-caf\xe9'
printf stray > stray
"""
