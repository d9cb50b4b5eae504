# leafd image: built with the project's Cargo.lock, run as an unprivileged user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/leafd

FROM debian:bookworm-slim
# A fixed uid/gid (10001), so that Kubernetes' runAsNonRoot can check the numeric USER and
# volumes can be owned by it. /var/lib/leafd/data is the state directory the shipped configs
# name (storage.state_dir): created here owned by leafd, so that a named volume mounted on it
# starts writable.
RUN groupadd --system --gid 10001 leafd \
 && useradd --system --uid 10001 --gid leafd --home-dir /var/lib/leafd --create-home leafd \
 && install -d -o leafd -g leafd -m 0750 /var/lib/leafd/data
COPY --from=build /src/target/release/leafd /usr/local/bin/leafd
USER 10001:10001
WORKDIR /var/lib/leafd
EXPOSE 6380 9380
ENTRYPOINT ["/usr/local/bin/leafd"]
CMD ["--config", "/etc/leafd/leafd.toml"]
