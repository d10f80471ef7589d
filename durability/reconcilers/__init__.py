"""Reconcilers: ask the external system whether an effect happened (docs/reconcilers.md).

`base` defines the interface; the plug-ins (`http_probe`, `git_probe`, and any of a
deployment's own) are named by dotted path in settings.TALLYBOOK_RECONCILERS and loaded on
first use. A project configures one per target system with a `ReconcilerConfig`;
`services` probes effects and settles them on the answers.
"""
