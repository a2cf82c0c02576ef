"""Fault tests with several hosts (network namespaces) use the fixtures of
support.host_fixtures: ``net``, ``cluster``, ``spark_cluster``."""

from support.host_fixtures import cluster, net, spark_cluster

__all__ = ["cluster", "net", "spark_cluster"]
