package index

// stopwords are dropped before stemming. The list is the common English
// function words (close to NLTK's and Lucene's lists) plus the apostrophe-less
// spellings the tokenizer produces for contractions ("don't" → "dont").
// Content words that questions rely on ("like", "want", "first") stay.
var stopwords = func() map[string]struct{} {
	words := []string{
		"a", "about", "above", "after", "again", "against", "all", "am", "an",
		"and", "any", "are", "as", "at", "be", "because", "been", "before",
		"being", "below", "between", "both", "but", "by", "can", "could", "did",
		"do", "does", "doing", "down", "during", "each", "few", "for", "from",
		"further", "had", "has", "have", "having", "he", "her", "here", "hers",
		"herself", "him", "himself", "his", "how", "i", "if", "in", "into",
		"is", "it", "its", "itself", "just", "me", "more", "most", "my",
		"myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only",
		"or", "other", "our", "ours", "ourselves", "out", "over", "own", "same",
		"she", "should", "so", "some", "such", "than", "that", "the", "their",
		"theirs", "them", "themselves", "then", "there", "these", "they",
		"this", "those", "through", "to", "too", "under", "until", "up", "very",
		"was", "we", "were", "what", "when", "where", "which", "while", "who",
		"whom", "why", "will", "with", "would", "you", "your", "yours",
		"yourself", "yourselves", "s", "t", "d", "ll", "m", "re", "ve", "also",
		"yet", "may", "might", "must", "shall", "us",
		// contractions without their apostrophe
		"im", "ive", "id", "youre", "youve", "youd", "youll", "hes", "shes",
		"theyre", "theyve", "theyll", "weve", "were", "dont", "doesnt",
		"didnt", "isnt", "arent", "wasnt", "werent", "hasnt", "havent",
		"hadnt", "cant", "couldnt", "wouldnt", "shouldnt", "wont", "thats",
		"whats", "theres", "lets",
	}
	m := make(map[string]struct{}, len(words))
	for _, w := range words {
		m[w] = struct{}{}
	}
	return m
}()

func isStopword(w string) bool {
	_, ok := stopwords[w]
	return ok
}
