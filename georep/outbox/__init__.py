"""The durable client-side outbox: the SQLite store, its SQL, the drainer, and how a send
enqueues.
"""
