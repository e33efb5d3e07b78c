package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// configCase is one case of tests/unit/config_cases.yaml (its header says the format).
type configCase struct {
	Name   string `yaml:"name"`
	Text   string `yaml:"text"`
	Expect struct {
		Config map[string]any `yaml:"config"`
		Says   string         `yaml:"says"`
		YAML   bool           `yaml:"yaml"`
	} `yaml:"expect"`
}

func readCases(t *testing.T) []configCase {
	t.Helper()
	text, err := os.ReadFile("../../tests/unit/config_cases.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []configCase `yaml:"cases"`
	}
	if err := yaml.Unmarshal(text, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 50 {
		t.Fatalf("read %d cases; the file has more", len(doc.Cases))
	}
	return doc.Cases
}

// TestEachConfigReadsAsWritten runs tests/unit/config_cases.yaml against Parse;
// tests/unit/test_config_cases.py runs it against egpu/config.py. Bug caught: a key, default,
// bound or refusal's words changed on one side only.
func TestEachConfigReadsAsWritten(t *testing.T) {
	for _, c := range readCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			got, err := Parse(c.Text)
			switch {
			case c.Expect.Config != nil:
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				read := asWritten(t, got)
				for key, want := range c.Expect.Config {
					if !reflect.DeepEqual(read[key], plain(t, want)) {
						t.Errorf("%s: read %#v, want %#v", key, read[key], plain(t, want))
					}
				}
			case c.Expect.YAML:
				if err == nil || !strings.HasPrefix(err.Error(), "config: not valid YAML (") {
					t.Fatalf("want a YAML refusal, got %v", err)
				}
			default:
				if err == nil || err.Error() != c.Expect.Says {
					t.Fatalf("refusal\n got: %v\nwant: %s", err, c.Expect.Says)
				}
			}
		})
	}
}

// asWritten is the config under its file's names, as JSON reads it back.
func asWritten(t *testing.T, c Config) map[string]any {
	t.Helper()
	return plain(t, c).(map[string]any)
}

// plain is a case's value as JSON reads it back (numbers as float64).
func plain(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTheDefaultsCaseNamesEveryKey: the first case holds every key, so that a key added to
// Config is checked against egpu/config.py. Bug caught: a key only one reader knows.
func TestTheDefaultsCaseNamesEveryKey(t *testing.T) {
	first := readCases(t)[0].Expect.Config
	read := asWritten(t, Default())
	for key := range read {
		if _, ok := first[key]; !ok {
			t.Errorf("the first case does not check %s", key)
		}
	}
	if len(read) != len(first) {
		t.Errorf("Config has %d keys, the first case %d", len(read), len(first))
	}
}

// TestABadFileRunsOnTheLastGoodOne: LoadKeeping keeps a good file and falls back to it, with
// the error, when the file turns bad; without a kept copy the error stands. Bugs caught: a
// restart on a hand-edited bad ConfigMap taking the scheduler down although it had a good
// config, or guessing defaults when it never had one.
func TestABadFileRunsOnTheLastGoodOne(t *testing.T) {
	dir := t.TempDir()
	file, keep := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "keep")
	if _, err := LoadKeeping(file, keep); err == nil {
		t.Fatal("a missing file with nothing kept was read")
	}
	good := "sharesPerCard: 4\n"
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadKeeping(file, keep)
	if err != nil || loaded.Source != "file" || loaded.Config.SharesPerCard != 4 ||
		loaded.Generation != Generation(good) {
		t.Fatalf("good file: %+v, %v", loaded, err)
	}
	if err := os.WriteFile(file, []byte("sharesPerCard: 99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err = LoadKeeping(file, keep)
	if err != nil || loaded.Source != "last-good" || loaded.Config.SharesPerCard != 4 ||
		!strings.Contains(loaded.Err, "sharesPerCard: 99 is out of range") ||
		loaded.Generation != Generation(good) {
		t.Fatalf("bad file: %+v, %v", loaded, err)
	}
	if _, err := LoadKeeping(file, ""); err == nil {
		t.Fatal("a bad file with no keep folder was read")
	}
	if loaded, err := LoadKeeping("", ""); err != nil || loaded.Generation != "defaults" ||
		loaded.Config.SharesPerCard != 10 {
		t.Fatalf("no file: %+v, %v", loaded, err)
	}
}

// Bugs caught: a file whose alias refers to the node holding it overflowing the stack (a
// fatal error, no fallback to the last good config), one of nested aliases built out in full
// (memory), and a file of many keys checked for repeats pair by pair (minutes). Each is
// refused or read, never a crash.
func TestHostileYAMLIsRefusedOrReadNotFatal(t *testing.T) {
	for _, text := range []string{"defaults: &a {priority: *a}", "x: &a [*a]",
		"a: &a {b: &b [*a]}"} {
		if _, err := Parse(text); err == nil || !strings.HasPrefix(err.Error(),
			"config: not valid YAML (") {
			t.Errorf("%q: %v; want a YAML refusal", text, err)
		}
	}
	var bomb strings.Builder // 10^9 leaves written out; 10 nodes a level shared
	bomb.WriteString("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&bomb, "l%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n",
			i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	bomb.WriteString("schedulerName: *l9\n")
	_, err := Parse(bomb.String())
	if err == nil || !strings.HasPrefix(err.Error(), "l0: unknown key") ||
		len(err.Error()) > 2*reprMax {
		t.Errorf("the alias bomb: %.200v", err)
	}
	var many strings.Builder
	many.WriteString("priorityClasses:\n")
	for i := 0; i < 60000; i++ {
		fmt.Fprintf(&many, "  class-%d: low\n", i)
	}
	c, err := Parse(many.String())
	if err != nil || len(c.PriorityClasses) != 60000 {
		t.Errorf("60000 priority classes: %d read, %v", len(c.PriorityClasses), err)
	}
}
