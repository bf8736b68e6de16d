# warmpath: one binary linked against libzmq (cgo), built in the Go image and
# run from a slim Debian one as an unprivileged user. Nothing publishes this
# image: build it and push it to your own registry.
#
#   docker build -t registry.example.com/warmpath:v0.1.0 .
#   docker run --rm -p 8080:8080 registry.example.com/warmpath:v0.1.0   # embedded dev setup
#
# deploy/compose_test.go checks the claims below (stages, user, port).
FROM golang:1.26-bookworm AS build
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libzmq3-dev pkg-config >/dev/null \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o /out/warmpath ./cmd/warmpath

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libzmq5 ca-certificates >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/warmpath /usr/local/bin/warmpath
# Listen on every interface: the gateway's default, 127.0.0.1:8080, is
# unreachable from outside a container. The variable overrides a
# configuration file's listen; set it to move the port. /metrics, /healthz
# and /readyz are served on the same port.
ENV WARMPATH_LISTEN=0.0.0.0:8080
EXPOSE 8080
# The distroless "nonroot" uid; the Kubernetes manifests run as it too.
USER 65532:65532
ENTRYPOINT ["warmpath"]
CMD ["serve"]
