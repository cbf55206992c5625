# One image for every role of a zkcontroller cluster; `zkctl` is the entrypoint:
#   zk start --foreground | controller run | broker run | api run
# Build: docker build --network host -t zkcontroller [--build-arg BASE=debian:bookworm-slim] .
#        (or `zkctl cluster build`, which does the same through the Docker SDK)
ARG BASE=debian:bookworm-slim
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/zkc \
    PATH=/opt/zkc/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ZKC_STATE_DIR=/data/state

# Python 3.11 and Java 17 from Debian bookworm (the ZooKeeper and Spark jars come inside pyspark)
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv openjdk-17-jre-headless procps ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/zkc

# Dependencies in their own layer: rebuilt only when setup.cfg changes, not on every code change
# (build-ca.pem, when the build context has one, is a CA bundle for pip behind a TLS-intercepting proxy:
#  `zkctl cluster build --ca-bundle PATH` puts it there for the build only; it is not kept in the image)
COPY setup.cfg build-ca.pe[m] /tmp/build/
RUN if [ -s /tmp/build/build-ca.pem ]; then export PIP_CERT=/tmp/build/build-ca.pem; fi \
 && python3 -c "import configparser; c = configparser.ConfigParser(); c.read('/tmp/build/setup.cfg'); \
print('\n'.join(l.split('#')[0].strip() for l in c['options']['install_requires'].splitlines() \
if l.split('#')[0].strip()))" > /tmp/requirements.txt \
 && pip install "setuptools>=68" wheel && pip install -r /tmp/requirements.txt \
 && rm -rf /tmp/build

COPY . /src
RUN pip install --no-deps --no-build-isolation /src \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin zkc \
 && mkdir -p /data/state /data/checkpoints \
 && chown -R zkc /data

USER zkc
WORKDIR /home/zkc
VOLUME ["/data/state", "/data/checkpoints"]
# what it checks follows the role (ZKC_ROLE: zk, controller, broker, api); see `zkctl health --help`
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["zkctl", "health"]
ENTRYPOINT ["zkctl"]
CMD ["--help"]
