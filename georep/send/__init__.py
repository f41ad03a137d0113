"""Sending: GeoSender, its pipeline, the passive and active paths, results, scheduling, session
order stamps and the ledger rows of a send.
"""
