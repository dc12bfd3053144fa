package index

// This file implements the Porter stemming algorithm (M.F. Porter, "An
// algorithm for suffix stripping", Program 14(3), 1980) over lower-case ASCII
// words. The steps follow the paper; the comments name them the same way.
//
// A word is a sequence of consonants (C) and vowels (V), written
// [C](VC){m}[V]; m is its "measure". 'y' is a vowel when it follows a
// consonant.

// stem returns the Porter stem of w. w must be lower-case; words that are not
// pure ASCII letters, or shorter than three letters, are returned unchanged.
func stem(w string) string {
	if len(w) < 3 {
		return w
	}
	for i := 0; i < len(w); i++ {
		if c := w[i]; c < 'a' || c > 'z' {
			return w
		}
	}
	var buf [64]byte
	var b []byte
	if len(w) <= len(buf) {
		b = append(buf[:0], w...)
	} else {
		b = []byte(w)
	}
	s := stemmer{b: b}
	s.step1a()
	s.step1b()
	s.step1c()
	s.step2()
	s.step3()
	s.step4()
	s.step5()
	if string(s.b) == w { // no allocation: compiler optimises the comparison
		return w
	}
	return string(s.b)
}

type stemmer struct {
	b []byte
}

// cons reports whether b[i] is a consonant.
func (s *stemmer) cons(i int) bool {
	switch s.b[i] {
	case 'a', 'e', 'i', 'o', 'u':
		return false
	case 'y':
		return i == 0 || !s.cons(i-1)
	}
	return true
}

// measure returns m for the prefix b[:n].
func (s *stemmer) measure(n int) int {
	m := 0
	i := 0
	for i < n && s.cons(i) {
		i++
	}
	for i < n {
		for i < n && !s.cons(i) {
			i++
		}
		if i >= n {
			break
		}
		for i < n && s.cons(i) {
			i++
		}
		m++
	}
	return m
}

// hasVowel reports whether the prefix b[:n] contains a vowel.
func (s *stemmer) hasVowel(n int) bool {
	for i := 0; i < n; i++ {
		if !s.cons(i) {
			return true
		}
	}
	return false
}

// doubleCons reports whether b[:n] ends with a double consonant.
func (s *stemmer) doubleCons(n int) bool {
	return n >= 2 && s.b[n-1] == s.b[n-2] && s.cons(n-1)
}

// cvc reports whether b[:n] ends consonant-vowel-consonant where the last
// consonant is not w, x or y (the *o condition).
func (s *stemmer) cvc(n int) bool {
	if n < 3 || !s.cons(n-1) || s.cons(n-2) || !s.cons(n-3) {
		return false
	}
	switch s.b[n-1] {
	case 'w', 'x', 'y':
		return false
	}
	return true
}

func (s *stemmer) ends(suffix string) bool {
	n := len(s.b)
	return n >= len(suffix) && string(s.b[n-len(suffix):]) == suffix
}

// stemLen is the length of the word without suffix.
func (s *stemmer) stemLen(suffix string) int { return len(s.b) - len(suffix) }

func (s *stemmer) replace(suffix, with string) {
	s.b = append(s.b[:len(s.b)-len(suffix)], with...)
}

// replaceIfM replaces suffix by with when the stem's measure exceeds min; it
// reports whether suffix matched (even when the condition failed), so rule
// lists stop at the first matching suffix as the algorithm requires.
func (s *stemmer) replaceIfM(suffix, with string, min int) bool {
	if !s.ends(suffix) {
		return false
	}
	if s.measure(s.stemLen(suffix)) > min {
		s.replace(suffix, with)
	}
	return true
}

func (s *stemmer) step1a() {
	switch {
	case s.ends("sses"):
		s.replace("sses", "ss")
	case s.ends("ies"):
		s.replace("ies", "i")
	case s.ends("ss"):
	case s.ends("s"):
		s.replace("s", "")
	}
}

func (s *stemmer) step1b() {
	if s.ends("eed") {
		if s.measure(s.stemLen("eed")) > 0 {
			s.replace("eed", "ee")
		}
		return
	}
	cut := ""
	switch {
	case s.ends("ed") && s.hasVowel(s.stemLen("ed")):
		cut = "ed"
	case s.ends("ing") && s.hasVowel(s.stemLen("ing")):
		cut = "ing"
	default:
		return
	}
	s.replace(cut, "")
	n := len(s.b)
	switch {
	case s.ends("at"), s.ends("bl"), s.ends("iz"):
		s.b = append(s.b, 'e')
	case s.doubleCons(n):
		switch s.b[n-1] {
		case 'l', 's', 'z':
		default:
			s.b = s.b[:n-1]
		}
	case s.measure(n) == 1 && s.cvc(n):
		s.b = append(s.b, 'e')
	}
}

func (s *stemmer) step1c() {
	if s.ends("y") && s.hasVowel(len(s.b)-1) {
		s.b[len(s.b)-1] = 'i'
	}
}

var step2Rules = [...][2]string{
	{"ational", "ate"}, {"tional", "tion"}, {"enci", "ence"}, {"anci", "ance"},
	{"izer", "ize"}, {"abli", "able"}, {"alli", "al"}, {"entli", "ent"},
	{"eli", "e"}, {"ousli", "ous"}, {"ization", "ize"}, {"ation", "ate"},
	{"ator", "ate"}, {"alism", "al"}, {"iveness", "ive"}, {"fulness", "ful"},
	{"ousness", "ous"}, {"aliti", "al"}, {"iviti", "ive"}, {"biliti", "ble"},
}

func (s *stemmer) step2() {
	for _, r := range step2Rules {
		if s.replaceIfM(r[0], r[1], 0) {
			return
		}
	}
}

var step3Rules = [...][2]string{
	{"icate", "ic"}, {"ative", ""}, {"alize", "al"}, {"iciti", "ic"},
	{"ical", "ic"}, {"ful", ""}, {"ness", ""},
}

func (s *stemmer) step3() {
	for _, r := range step3Rules {
		if s.replaceIfM(r[0], r[1], 0) {
			return
		}
	}
}

var step4Suffixes = [...]string{
	"al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment",
	"ent", "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize",
}

func (s *stemmer) step4() {
	for _, suf := range step4Suffixes {
		if !s.ends(suf) {
			continue
		}
		n := s.stemLen(suf)
		if suf == "ion" && (n == 0 || (s.b[n-1] != 's' && s.b[n-1] != 't')) {
			return
		}
		if s.measure(n) > 1 {
			s.b = s.b[:n]
		}
		return
	}
}

func (s *stemmer) step5() {
	n := len(s.b)
	if s.b[n-1] == 'e' {
		m := s.measure(n - 1)
		if m > 1 || (m == 1 && !s.cvc(n-1)) {
			s.b = s.b[:n-1]
			n--
		}
	}
	if n >= 2 && s.b[n-1] == 'l' && s.doubleCons(n) && s.measure(n) > 1 {
		s.b = s.b[:n-1]
	}
}
