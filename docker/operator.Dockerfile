# streamscale-operator image. Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/streamscale/streamscale-operator:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p streamscale-operator --bin streamscale-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/streamscale-operator /usr/local/bin/streamscale-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/streamscale-operator"]
