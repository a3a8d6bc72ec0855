# A stand-in for python:3.11-slim-bookworm built from a local Debian bookworm base (where public
# images cannot be pulled): Debian's Python 3.11 in a virtual environment first on PATH, so that
# `pip install` and `python` behave as in the public image. pip verifies with the system's CA
# bundle (the public image's pip uses its own), which holds any CA the base image was given in
# /usr/local/share/ca-certificates.
ARG BASE_IMAGE=localhost/pgcdc-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/python
ENV PATH=/opt/python/bin:$PATH PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
CMD ["python3"]
