# Carina — the two commands of the quick start are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build images manifests demo demo-clean test test-unit test-engine test-grpc test-repeat soak test-cold e2e lint bench bench-scale deps tools

all: build

build:
	$(CARGO) build --workspace

deps:
	hack/install-deps.sh

## images: OCI image archives of carina-node, carina-controller and carina-scheduler in target/images (no container engine needed)
images: deps
	hack/images.sh target/images

## manifests: render deploy/kubernetes/ and deploy/scheduler/deployment.yaml from the Helm chart (builds helm on first use)
manifests:
	hack/render-manifests.sh

## demo: build, start a node on a loop-device pool with dev certificates, drive it with carinactl
demo: deps
	$(CARGO) build --release -p carina-node -p carina-ctl --bins
	hack/demo.sh

demo-clean:
	hack/demo.sh clean

## test: install what is missing, then run every test tier
test: deps
	hack/test.sh

test-unit:
	hack/test.sh unit
test-engine: deps
	hack/test.sh engine
test-grpc: deps
	hack/test.sh grpc

## soak: 4 workers cycle volumes on every policy for DURATION (90s, 10m, 1h; default 2m, what `make test` runs), the node sampled at rest; fails on growth; samples in target/test-logs/soak.json
DURATION ?= 2m
soak: deps
	CARINA_SOAK_DURATION=$(DURATION) hack/test.sh soak

## test-cold: every tier as on a fresh machine, with empty tool and build caches (prints its time)
test-cold: deps
	hack/test-cold.sh

## test-repeat: run one tier N times in a row and count passes per test (make test-repeat N=20 TIER=kube)
N ?= 20
TIER ?= kube
test-repeat: deps
	hack/test-repeat.sh $(N) $(TIER)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## e2e: the real-node scenarios and the storage e2e subset (the node and e2e tiers), then every storage e2e suite that applies to one node
e2e: deps
	hack/test.sh node e2e
	$(CARGO) test -p carina-tests --test e2e_storage -- --ignored --nocapture --test-threads=1

## bench: measure against the raw commands; writes docs/benchmarks.md and docs/benchmarks.json
bench: deps
	tests/tools/build.sh etcd kube jaeger kubelet containerd crictl cni helm test-images
	$(CARGO) build --release -p carina-bench -p carina-node --bin carina-node
	$(CARGO) run --release -q -p carina-bench -- --out docs

## bench-scale: the scale simulation at full size (100 carina-node processes, 1,000 volumes through the kube path); writes its group into docs/benchmarks.md and docs/benchmarks.json beside the others
bench-scale: deps
	$(CARGO) build --release -p carina-bench -p carina-node -p carina-controlplane -p carina-scheduler --bins
	tests/tools/build.sh etcd kube
	$(CARGO) run --release -q -p carina-bench -- scale --out docs
