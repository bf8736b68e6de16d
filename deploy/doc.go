// Package deploy holds no code for the binary: its tests check the
// deployment files in this directory, the repository's docker-compose.yml
// and the real-vLLM recipe of docs/getting-started.md offline, since CI has no Docker,
// Kubernetes or GPU.
//
//   - deploy_test.go decodes every manifest in kubernetes/ strictly into the
//     Kubernetes API types (unknown fields fail) and checks what the
//     manifests' comments promise: Pod Security "restricted", probes,
//     shutdown timing, memory sizing, Secrets, and that the ConfigMap's
//     configuration parses and agrees with the vLLM Deployment and its
//     headless Service.
//   - compose_test.go decodes docker-compose.yml strictly and checks that the
//     mounted gateway configurations parse and agree with the services'
//     ports, models and KV-event endpoints, for the simulated fleet and the
//     real-vLLM profile.
//   - compose_test.go also checks the Dockerfile (stages, non-root user,
//     listen address, exposed port), and run_test.go that ./run installs a
//     C compiler where cgo cannot build.
//   - recipe_test.go serves the getting-started guide's real-vLLM gateway
//     configuration against the simulator started under the model id the
//     guide's vllm serve command would serve, through the real gateway.
//
// The package owns no Redis keys and runs no goroutines.
package deploy
