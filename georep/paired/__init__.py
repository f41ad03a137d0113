"""Paired namespaces: options, PairedSender, its failover timer and pinger, the backlog
rotation and the syphon.
"""
