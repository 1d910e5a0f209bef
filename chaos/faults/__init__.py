"""The nemesis (Jepsen's role): which kinds of fault exist (``kinds``), the seeded plan of a
run (``plans``), when each planned fault fires and ends (``schedule``), the nemesis protocol
(``nemesis``), and the machinery some faults need: the failpoint rendezvous a kill waits at
(``rendezvous``), the link proxy a cut link breaks (``link_proxy``) and the drivers' host
that loses power (``host_power``). This package's ``__init__`` imports nothing."""
