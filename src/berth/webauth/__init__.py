"""Who may call Berth's HTTP APIs: authentication and authorization, shared by the
Placement API and the scheduler API (an adapter around the core, as the APIs are).

* :mod:`berth.webauth.identity`: who is calling (``[api] auth_strategy``: Keystone tokens
  through keystonemiddleware, or noauth2 for development);
* :mod:`berth.webauth.rules`: what they may do (oslo.policy with each API's default
  rules, the policy modes, an operator's policy file);
* :mod:`berth.webauth.settings`: both chosen from the config files and the command line,
  every problem one line naming the option; :mod:`berth.webauth.options` the command-line
  options (light to import: every ``berth`` command builds its parser).
"""
