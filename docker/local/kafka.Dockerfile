# A stand-in for apache/kafka built from a local Debian bookworm base: the broker's jars resolved
# from Maven Central as pgcdc.services.kafka resolves them, in /opt/kafka/libs. As in the public
# image, the configuration comes from KAFKA_* variables (KAFKA_NODE_ID -> node.id: the prefix
# dropped, lower case, _ -> ., __ -> _, ___ -> -), the storage is formatted on first start
# (CLUSTER_ID), and /opt/kafka/bin/kafka-topics.sh works (compose's health check).
ARG BASE_IMAGE=localhost/pgcdc-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven \
 && rm -rf /var/lib/apt/lists/*
COPY docker/local/kafka-pom.xml /tmp/resolve/pom.xml
COPY docker/local/maven-settings.xml /tmp/resolve/settings.xml
RUN cd /tmp/resolve \
 && mvn -B -q -s settings.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/opt/kafka/libs \
 && rm -rf /tmp/resolve /root/.m2
COPY docker/local/kafka-entrypoint.sh /opt/kafka/bin/entrypoint.sh
COPY docker/local/kafka-topics.sh /opt/kafka/bin/kafka-topics.sh
ENV CLUSTER_ID=5L6g3nShT-eMCtK--X86sw KAFKA_HEAP=512m
ENTRYPOINT ["/opt/kafka/bin/entrypoint.sh"]
EXPOSE 9092
