"""Kafka for the control plane: clients, offsets and time lookup, capability probes."""
