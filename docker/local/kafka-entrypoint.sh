#!/bin/sh
# server.properties from the KAFKA_* variables, as the public apache/kafka image writes it
# (KAFKA_HEAP, the JVM's heap, is this image's own); the storage formatted once; then the broker.
set -eu
config=/opt/kafka/config/server.properties
mkdir -p /opt/kafka/config
: > "$config"
env | grep '^KAFKA_' | grep -v '^KAFKA_HEAP=' | while IFS='=' read -r name value; do
    key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' \
          | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
    printf '%s=%s\n' "$key" "$value" >> "$config"
done
grep -q '^log\.dirs=' "$config" || echo "log.dirs=/var/lib/kafka/data" >> "$config"
logs=$(sed -n 's/^log\.dirs=//p' "$config" | cut -d, -f1)
set -- -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp '/opt/kafka/libs/*'
if [ ! -f "$logs/meta.properties" ]; then
    java "$@" kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$config"
fi
exec java "$@" "-Xmx$KAFKA_HEAP" -Xms128m -XX:+UseG1GC kafka.Kafka "$config"
