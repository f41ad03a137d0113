"""Programs that use azure-servicebus the way its documented samples do.

Each module has ``run_async(client, names, checkpoint)`` (async SDK: ``client`` is an
``azure.servicebus.aio.ServiceBusClient``) and ``run(client, names, checkpoint)`` (sync). They
print what they saw. ``tests/integration/test_dropin_client.py`` runs each one on the raw
SDK against one namespace, and on ``georep.servicebus``'s client over two regions, and
compares what they printed. ``names`` holds the entities (``queue``, ``topic``,
``subscription``, ``lock_queue`` with a 5 s lock); ``checkpoint()`` is where the test may
take the primary region down (a no-op otherwise).

Where a program prints messages in the order it received them from a sessionless entity,
it sorts them first: Service Bus promises no order there, and across two regions none is
kept.
"""
