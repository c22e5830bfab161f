# streamscale-engine image (run by the operator for each StreamJob). Build from the repository root:
#   docker build -f docker/engine.Dockerfile -t ghcr.io/streamscale/streamscale-engine:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p streamscale-engine --bin streamscale-engine

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/streamscale-engine /usr/local/bin/streamscale-engine
USER 65532:65532
EXPOSE 8081
ENTRYPOINT ["/usr/local/bin/streamscale-engine"]
