"""Retention: what a project's policy lets go, removed so that the ledger stays provable.

`services` prunes payloads (and, through the database's one path, the audit data that
repeats them); `archive` writes what retention would remove to a file that leaves the
building, and verifies one against the audit chains; `jobs` is the scheduled pass.
"""
