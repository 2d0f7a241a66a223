"""The checks, one folder each: its ``__init__.py`` declares ``CHECK`` (the registry finds it).

opsctl.domain.check_registry scans this package: a folder here with a ``CHECK`` is a check
on every surface it declares (``opsctl diag``, certify, the console). A declaration
imports only pure modules at its top; its loaders import the check's code when called.
"""
