"""The relay failover channel: FailoverChannel and what every endpoint shares."""
