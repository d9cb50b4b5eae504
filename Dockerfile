# leafd image: built with the project's Cargo.lock, run as an unprivileged user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/leafd

FROM debian:bookworm-slim
RUN useradd --system --home /var/lib/leafd --create-home leafd
COPY --from=build /src/target/release/leafd /usr/local/bin/leafd
USER leafd
WORKDIR /var/lib/leafd
EXPOSE 6380 9380
ENTRYPOINT ["/usr/local/bin/leafd"]
CMD ["--config", "/etc/leafd/leafd.toml"]
