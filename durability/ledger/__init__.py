"""The ledger: effects, their attempts, receipts and cases; the only writer of Effect.state.

- machine.py    the transition table and `apply`, the one writer of an effect's state; row locks
- decisions.py  the decision an intent for a recorded effect gets, and `decide`, its dry run
- intents.py    `intent_record`: new effects through the grant check, attempts, retries, conflicts
- evidence.py   `receipt_record`, `failure_record`, `timeout_record`, `deadlines_sweep`
- settling.py   `effect_settle` (operators' and reconcilers' verdicts), `effect_approval_decide`
- cases.py      opening and closing cases, the one place either happens
- authority.py  the grant check and evidence compared with the grant
- signals.py    `effect_recorded`, so the ledger imports nothing of the apps that listen
- jobs.py       the deadline sweep job

It imports the models, the audit trail, the site's address, the API's input schemas and
itself; never trajectories, a views module, or the desk, authority and accounts rooms
(tests/test_layout.py holds it to that).
"""
