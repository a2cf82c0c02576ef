# The reorg image: `reorg worker`, `reorg db upgrade`, and the Spark standalone
# master and worker of docker-compose.yml all run from it.
#
# - Python 3.11, the version reorg's driver runs: Spark runs Python UDFs on its
#   executors with the driver's interpreter path, so the Spark worker runs
#   from this same image (pyspark's own spark-class) rather than from
#   apache/spark, whose Python is 3.10.
# - pyspark pinned: the Spark cluster is this very pyspark, so driver and
#   cluster are always one version (pyproject.toml allows the same minor).
# - A Java 17 JRE and the PostgreSQL JDBC driver from Debian, at the path
#   REORG_JDBC_JAR names: nothing is downloaded when a container starts.
# - A non-root user, with a home for Spark's class-data archive and work dirs.
#
#   docker build -t reorg .
#   docker run --rm -e REORG_DATABASE_URL=postgresql://... reorg reorg db upgrade

FROM python:3.11-slim-bookworm

ARG PYSPARK_VERSION=4.3.0

# Debian's stable packages, not pinned to a version: bookworm only moves
# them for security fixes, which a rebuilt image should take.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless \
        libpostgresql-jdbc-java \
        procps \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REORG_JDBC_JAR=/usr/share/java/postgresql.jar \
    SPARK_WORKER_DIR=/home/reorg/spark-work

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin reorg

WORKDIR /opt/reorg
COPY pyproject.toml README.md ./
COPY framework ./framework
COPY backfill ./backfill
COPY cli ./cli
COPY migrations ./migrations
# Installed as root into the system site-packages (read-only to the user);
# pyspark's own console scripts (spark-class, spark-submit) land on PATH.
RUN pip install --no-cache-dir "pyspark==${PYSPARK_VERSION}" . \
    && reorg --version \
    && test -f "$REORG_JDBC_JAR"

# The numeric id of the reorg user above (Kubernetes' runAsNonRoot checks the number).
USER 10001:10001
WORKDIR /home/reorg
CMD ["reorg", "worker"]
