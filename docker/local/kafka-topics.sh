#!/bin/sh
exec java -Xmx128m -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp '/opt/kafka/libs/*' \
    org.apache.kafka.tools.TopicCommand "$@"
