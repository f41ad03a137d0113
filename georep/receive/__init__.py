"""Receiving: GeoReceiver, its region and session loops, the order gate, duplicate suppression,
settlement, outcomes and peeking.
"""
