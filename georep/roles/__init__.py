"""Shared roles: the role state, the store that shares it across a fleet, how a sender joins
it, and what the operator commands do.
"""
