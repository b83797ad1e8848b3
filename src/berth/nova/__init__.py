"""Berth as a drop-in nova-scheduler for a real Nova deployment (no Nova code imported).

:mod:`~berth.nova.primitives` converts Nova's versioned-object primitives to and from
Berth's model; :mod:`~berth.nova.rpc` serves Nova's scheduler RPC interface on
oslo.messaging.
"""
