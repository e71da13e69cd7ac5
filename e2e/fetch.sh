#!/usr/bin/env bash
# Fetches Apache Kafka (broker, tools, Connect), Debezium's PostgreSQL
# connector and Apicurio's AvroConverter from Maven Central into
# $SCD2SINK_E2E_CACHE (default ~/.cache/scd2sink-e2e), and builds Apicurio
# Registry there, once: later runs reuse the folders.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SCD2SINK_E2E_CACHE:-$HOME/.cache/scd2sink-e2e}"
mkdir -p "$cache"
# Debezium and Apicurio's converter go into folders of their own under
# plugins/, Connect's plugin.path.
for part in kafka debezium apicurio-converter; do
  case "$part" in
    kafka) dest="$cache/lib/kafka" ;;
    debezium) dest="$cache/plugins/debezium-postgres" ;;
    apicurio-converter) dest="$cache/plugins/apicurio-converter" ;;
  esac
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
# Debezium's MariaDB connector: 3.6.1 is not served (nor 3.6.0); 3.5.0 is,
# as a plugin tarball. Kafka's and slf4j's jars come from the worker.
mdb="$cache/plugins/debezium-connector-mariadb"
if [ ! -f "$mdb/.complete-3.5.0" ]; then
  rm -rf "$mdb" "$cache/dl"; mkdir -p "$cache/dl"
  echo "e2e: fetching the MariaDB connector into $mdb" >&2
  mvn -q -B -Dstyle.color=never dependency:copy \
    -Dartifact=io.debezium:debezium-connector-mariadb:3.5.0.Final:tar.gz:plugin -DoutputDirectory="$cache/dl" >&2
  tar -xzf "$cache/dl"/debezium-connector-mariadb-*.tar.gz -C "$cache/plugins"
  rm -f "$mdb"/kafka-clients-*.jar "$mdb"/connect-api-*.jar "$mdb"/slf4j-api-*.jar
  rm -rf "$cache/dl"
  touch "$mdb/.complete-3.5.0"
fi
# Apicurio Registry 2.4.2 (in-memory storage), rebuilt as a Quarkus runner
# jar (see maven/apicurio-registry/pom.xml) in a copy of its folder under the
# cache, so nothing lands in the work tree. Kept: apicurio-registry-runner.jar
# and its lib/. Run: java -Dquarkus.http.host=127.0.0.1
# -Dquarkus.http.port=PORT -jar apicurio-registry-runner.jar
reg="$cache/apicurio-registry"
sum="$(cd "$here/maven/apicurio-registry" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
if [ ! -f "$reg/.complete-$sum" ]; then
  rm -rf "$reg"; mkdir -p "$reg"
  echo "e2e: building Apicurio Registry into $reg" >&2
  cp -R "$here/maven/apicurio-registry" "$reg/build"
  mvn -q -B -Dstyle.color=never -f "$reg/build/pom.xml" package \
    -DskipDefault -Dcheckstyle.skip -DskipTests >&2
  mv "$reg/build/target/apicurio-registry-runner.jar" "$reg/build/target/lib" "$reg/"
  rm -rf "$reg/build"
  touch "$reg/.complete-$sum"
fi
echo "$cache"
