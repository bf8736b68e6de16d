package fairq

import (
	"errors"
	"net/http"
	"testing"

	"github.com/warmpath/warmpath/internal/apierror"
)

func TestDeriveClass(t *testing.T) {
	const I, B = Interactive, Background
	tests := []struct {
		name       string
		tier       string
		background bool
		header     string
		def, ceil  Class
		want       Class
		wantParam  string // "" = no error
	}{
		{"default interactive", "", false, "", I, I, I, ""},
		{"tenant default background", "", false, "", B, I, B, ""},
		{"flex tier", "flex", false, "", I, I, B, ""},
		{"priority tier beats background flag", "priority", true, "background", B, I, I, ""},
		{"flex tier beats header", "flex", false, "interactive", I, I, B, ""},
		{"auto tier says nothing", "auto", true, "", I, I, B, ""},
		{"default tier says nothing", "default", false, "background", I, I, B, ""},
		{"scale tier says nothing", "scale", false, "", B, I, B, ""},
		{"background flag beats header", "", true, "interactive", I, I, B, ""},
		{"header interactive beats tenant default", "", false, " Interactive ", B, I, I, ""},
		{"header background", "", false, "BACKGROUND", I, I, B, ""},
		{"ceiling caps priority tier", "priority", false, "", I, B, B, ""},
		{"ceiling caps header", "", false, "interactive", I, B, B, ""},
		{"ceiling caps tenant default", "", false, "", I, B, B, ""},
		{"invalid ceiling counts as background", "", false, "", I, Class(7), B, ""},
		{"unknown tier", "turbo", false, "", I, I, 0, "service_tier"},
		{"unknown header", "", false, "urgent", I, I, 0, HeaderPriority},
		{"unknown header ignored once tier decides", "flex", false, "urgent", I, I, B, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DeriveClass(tt.tier, tt.background, tt.header, tt.def, tt.ceil)
			if tt.wantParam != "" {
				ae, ok := errors.AsType[*apierror.Error](err)
				if !ok || ae.Status != http.StatusBadRequest || ae.Param != tt.wantParam || ae.Type != apierror.TypeInvalidRequest {
					t.Fatalf("err = %v; want a 400 naming %s", err, tt.wantParam)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("DeriveClass = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestParseClass(t *testing.T) {
	for s, want := range map[string]Class{"interactive": Interactive, "Background": Background, " background\t": Background} {
		if got, err := ParseClass(s); err != nil || got != want {
			t.Errorf("ParseClass(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "batch", "0", "interactive,background"} {
		if _, err := ParseClass(s); err == nil {
			t.Errorf("ParseClass(%q) succeeded", s)
		}
	}
	if Interactive.String() != "interactive" || Background.String() != "background" || Class(9).String() != "class(9)" {
		t.Error("String")
	}
	if Interactive.VLLMPriority() != 0 || Background.VLLMPriority() != 1 || Class(9).VLLMPriority() != 1 {
		t.Error("VLLMPriority: interactive must be more urgent (lower) than background")
	}
}

// FuzzDeriveClass feeds the client-controlled inputs (service_tier and the
// X-Warmpath-Priority header): the result is a valid class no more urgent
// than the ceiling, or a 400.
func FuzzDeriveClass(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"flex", ""}, {"priority", "background"}, {"auto", "Interactive"}, {"x", "y"}, {"", "\xff\x00"}} {
		f.Add(s[0], false, s[1], uint8(0), uint8(0))
		f.Add(s[0], true, s[1], uint8(1), uint8(1))
	}
	f.Fuzz(func(t *testing.T, tier string, bg bool, header string, def, ceil uint8) {
		c, err := DeriveClass(tier, bg, header, Class(def), Class(ceil))
		if err != nil {
			if ae, ok := errors.AsType[*apierror.Error](err); !ok || ae.Status != http.StatusBadRequest || len(ae.Msg) > 300 {
				t.Fatalf("err = %v; want a short 400", err)
			}
			return
		}
		if c > Background || c < min(Class(ceil), Background) {
			t.Fatalf("DeriveClass = %v with ceiling %d", c, ceil)
		}
	})
}
