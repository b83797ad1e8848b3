"""Write the names of Nova's configuration options, by section, as JSON.

Run with the Python of an environment where Nova is installed (never Berth's: Berth does
not import Nova); the output is the fact table ``berth config check`` uses to tell
Nova's options that Berth does not use from typos::

    python -m venv /tmp/nova && /tmp/nova/bin/pip install 'nova==34.*'
    /tmp/nova/bin/python scripts/nova-option-names.py > src/berth/nova_options.json

(`make nova-options` does both, in .venv-nova.)

The namespaces are those of Nova's own sample-config generator file
(etc/nova/nova-config-generator.conf), so the table holds every option a nova.conf of
that release may set, deprecated names included (and the Keystone auth plugins' options
of ``[keystone_authtoken]``).
"""

import json
import sys

from oslo_config import generator

NAMESPACES = [
    "nova.conf", "oslo.log", "oslo.messaging", "oslo.policy", "oslo.privsep",
    "oslo.service.periodic_task", "oslo.service.service", "oslo.db", "oslo.db.concurrency",
    "oslo.cache", "oslo.middleware", "oslo.concurrency", "oslo.reports",
    "oslo.versionedobjects", "keystonemiddleware.auth_token", "osprofiler", "os_vif",
    "oslo.limit",
]


def main() -> None:
    import nova.version

    sections: dict[str, set[str]] = {}
    for _namespace, groups in generator._list_opts(NAMESPACES):
        for group, opts in groups:
            name = getattr(group, "name", group) or "DEFAULT"
            names = sections.setdefault(name, set())
            for opt in opts:
                names.add(opt.dest)
                for dep in opt.deprecated_opts:
                    if dep.name and (dep.group in (None, name)):
                        names.add(dep.name.replace("-", "_"))
                    elif dep.name and dep.group:
                        sections.setdefault(dep.group, set()).add(dep.name.replace("-", "_"))
    # keystonemiddleware's auth plugin options depend on [keystone_authtoken] auth_type,
    # so no namespace lists them: those of the plugins a deployment uses.
    from keystoneauth1 import loading

    for plugin in ("password", "v3password", "v3applicationcredential", "token", "v3token"):
        for opt in loading.get_auth_plugin_conf_options(plugin):
            sections["keystone_authtoken"].add(opt.dest)
    json.dump({"nova": nova.version.version_string(),
               "sections": {k: sorted(v) for k, v in sorted(sections.items())}},
              sys.stdout, indent=0, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
