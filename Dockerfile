# warmpath: one static-ish binary linked against libzmq.
FROM golang:1.26-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq libzmq3-dev pkg-config >/dev/null
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -trimpath -ldflags "-s -w" -o /out/warmpath ./cmd/warmpath

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq libzmq5 ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/warmpath /usr/local/bin/warmpath
USER 65532:65532
ENTRYPOINT ["warmpath"]
