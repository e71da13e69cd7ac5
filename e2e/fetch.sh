#!/usr/bin/env bash
# Fetches Apache Kafka (broker, tools, Connect) and Debezium's PostgreSQL
# connector from Maven Central into $SCD2SINK_E2E_CACHE (default
# ~/.cache/scd2sink-e2e), once: later runs reuse the lib folders.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SCD2SINK_E2E_CACHE:-$HOME/.cache/scd2sink-e2e}"
mkdir -p "$cache"
# Debezium goes into a folder of its own under plugins/, Connect's plugin.path.
for part in kafka debezium; do
  dest="$cache/lib/kafka"
  [ "$part" = debezium ] && dest="$cache/plugins/debezium-postgres"
  stamp="$dest/.complete-$(sha256sum "$here/maven/$part/pom.xml" | cut -c1-16)"
  if [ -f "$stamp" ]; then continue; fi
  rm -rf "$dest"; mkdir -p "$dest"
  echo "e2e: fetching $part jars into $dest" >&2
  mvn -q -B -Dstyle.color=never -f "$here/maven/$part/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$dest" >&2
  touch "$stamp"
done
# Debezium's JDBC sink (the peer benchmark): 3.6.1 is not served, 3.6.0 is,
# as a plugin tarball.
jdbc="$cache/plugins/debezium-connector-jdbc"
if [ ! -f "$jdbc/.complete" ]; then
  rm -rf "$jdbc" "$cache/dl"; mkdir -p "$cache/dl"
  echo "e2e: fetching the JDBC sink connector into $jdbc" >&2
  mvn -q -B -Dstyle.color=never dependency:copy \
    -Dartifact=io.debezium:debezium-connector-jdbc:3.6.0.Final:tar.gz:plugin -DoutputDirectory="$cache/dl" >&2
  tar -xzf "$cache/dl"/debezium-connector-jdbc-*.tar.gz -C "$cache/plugins"
  rm -rf "$cache/dl"
  touch "$jdbc/.complete"
fi
echo "$cache"
