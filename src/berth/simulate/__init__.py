"""Workload replay: ``berth simulate`` and ``berth trace generate``.

Modules: :mod:`~berth.simulate.trace` (formats), :mod:`~berth.simulate.generate`
(synthetic traces), :mod:`~berth.simulate.targets` (a cloud in process or a running
Berth), :mod:`~berth.simulate.ledger` (capacity and usage per node),
:mod:`~berth.simulate.run` (the replay), :mod:`~berth.simulate.report` (JSON, plots,
HTML) and :mod:`~berth.simulate.cli`.
"""
