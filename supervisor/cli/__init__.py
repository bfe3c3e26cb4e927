"""The ``zeroclaw`` command line and its client programs.

:mod:`supervisor.cli.main` parses the arguments in every zeroclaw process, then
hands over to a server (:mod:`supervisor.servers`) or to a client program here
(``--attach``, ``status``, ``config``, ``tenant``, ``store``), which never runs the host.

Kept empty: ``zeroclaw acp`` imports this package on its way to ``initialize``.
"""
