# wick serve in a container: Debian, built by `make build` (CPU; see docs/deploy.md for
# the CUDA variant), run as a non-root user, models from the /models volume.
#   docker build -t wick .
#   docker run -p 8080:8080 -v ~/.cache/wick/models:/models wick
FROM debian:bookworm-slim

# sudo-less apt in scripts/setup: the build runs as root, the server does not
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates git && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/wick
COPY . .
# Debian packages only: the Python test tooling is not part of the image
RUN WICK_SETUP_VENV=0 make build CMAKE_FLAGS="-DWICK_CUDA=OFF -DWICK_BUILD_BENCH=OFF -DWICK_BUILD_TESTS=OFF" \
    && strip build/bin/wick \
    && install -m 0755 build/bin/wick /usr/local/bin/wick \
    && rm -rf build /var/lib/apt/lists/*

RUN useradd --system --uid 10001 --home-dir /home/wick --create-home wick \
    && mkdir -p /models && chown wick:wick /models
ENV WICK_MODELS=/models
VOLUME ["/models"]
USER wick
EXPOSE 8080
# --host 0.0.0.0: the container's port is the boundary; name the Host headers clients use
# with --allowed-hosts when the port is reachable from outside (docs/deploy.md)
ENTRYPOINT ["wick", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD ["--model", "smollm2"]
