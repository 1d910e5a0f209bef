"""One campaign run (Jepsen's client and history): its phases (``runner``), what it is
(``spec``) and what it leaves (``record``), the drivers and processes it owns (``attempts``,
``processes``, ``launch``, ``driver_forks``, ``driver_server``), its Spaces (``spaces``), the
state its threads share (``state``), and the finished run turned into plain data
(``observe``). Modes reach a run through ``context`` only. This package's ``__init__``
imports nothing."""
