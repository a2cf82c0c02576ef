"""Fault tests with several hosts (network namespaces) use the fixtures of
support.host_fixtures: ``net``, ``cluster``, ``spark_cluster``; disk-full
tests ``small_disk`` (support.small_disk)."""

from support.host_fixtures import cluster, net, spark_cluster
from support.small_disk import small_disk

__all__ = ["cluster", "net", "small_disk", "spark_cluster"]
