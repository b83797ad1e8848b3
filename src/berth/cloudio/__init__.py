"""Cloud files from running clouds: ``berth cloud import`` and ``berth cloud export``.

    OpenStack (openstacksdk) ─ openstack.read_openstack ─┐
                                                         ├─ CloudState ─ emit.to_document ─ file
    berth serve (httpx)      ─ berth_source.read_berth ──┘
                 both read Placement with placement.read_providers

A source reads the compute side in its own API's shapes and Placement through the one
shared reader; :func:`~berth.cloudio.emit.to_document` joins each compute node with its
provider tree into a host entry and checks the result loads as a cloud file.

Glossary: *compute node* — a hypervisor (Nova's ComputeNode), keyed by its uuid, which is
its root resource provider's uuid; *service host* — the nova-compute host a node belongs
to (several nodes for Ironic); *sharing provider* — a root provider that lends its
inventory to the compute nodes of its aggregates (``MISC_SHARES_VIA_AGGREGATE``).
"""

from berth.cloudio.berth_source import BerthAPI, read_berth
from berth.cloudio.emit import build_document, dump, to_document
from berth.cloudio.openstack import OpenStackAPI, read_openstack
from berth.cloudio.state import CloudState, ComputeNode, Provider, Server

__all__ = ["BerthAPI", "CloudState", "build_document", "ComputeNode", "OpenStackAPI", "Provider", "Server",
           "dump", "read_berth", "read_openstack", "to_document"]
