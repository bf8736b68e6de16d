package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// On a machine with Go and libzmq but no C compiler, ./run installs gcc
// before building: without one Go turns cgo off and the ZMQ binding fails
// to compile. The test runs ./run with a PATH holding only the tools it
// needs and a stand-in apt-get that records its arguments and fails, so
// nothing is installed and nothing is built.
func TestRunInstallsCompiler(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("./run targets Debian")
	}
	if _, err := os.Stat("/usr/include/zmq.h"); err != nil {
		t.Skip("libzmq3-dev is not installed: ./run would install it first")
	}
	bin := t.TempDir()
	for _, tool := range []string{"bash", "go", "dirname", "id"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s not on PATH", tool)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(t.TempDir(), "apt.log")
	fake := "#!" + filepath.Join(bin, "bash") + "\necho \"$*\" >> " + log + "\n[ \"$1\" = update ] && exit 0\nexit 100\n"
	for _, name := range []string{"apt-get", "sudo"} {
		script := fake
		if name == "sudo" {
			script = "#!" + filepath.Join(bin, "bash") + "\nexec \"$@\"\n"
		}
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "bash"), "../run", "analyze", "-h")
	cmd.Env = []string{"PATH=" + bin, "HOME=" + os.Getenv("HOME"), "GOCACHE=" + goEnv(t, "GOCACHE"), "GOPATH=" + goEnv(t, "GOPATH"), "CC="}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("./run succeeded without a C compiler or a working apt-get:\n%s", out)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("./run never called apt-get: %v\n%s", err, out)
	}
	var installs []string
	for sc := bufio.NewScanner(strings.NewReader(string(b))); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == "install" {
			installs = append(installs, f...)
		}
	}
	for _, want := range []string{"gcc", "libc6-dev"} {
		if !slices.Contains(installs, want) {
			t.Errorf("apt-get calls %q; want an install of %s", b, want)
		}
	}
	if slices.Contains(installs, "libzmq3-dev") {
		t.Errorf("apt-get calls %q: libzmq3-dev is installed already", b)
	}
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
