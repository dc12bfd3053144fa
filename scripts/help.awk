# help.awk: `make help`. Reads the Makefile: a line "##@ Group" starts a
# group; a target line "name: … ## text" lists the target under it. Each
# $(VAR) in a text is replaced by the value given in -v vars="VAR=value …",
# so the help shows the defaults the targets run with. Names are aligned on
# the longest one.
BEGIN {
	n = split(vars, kv, " ")
	for (i = 1; i <= n; i++) {
		eq = index(kv[i], "=")
		if (eq > 0) val[substr(kv[i], 1, eq - 1)] = substr(kv[i], eq + 1)
	}
	ng = 0
}
/^##@ / { group[++ng] = substr($0, 5); next }
/^[a-z0-9][a-z0-9-]*:.*## / {
	name = $0; sub(/:.*/, "", name)
	text = $0; sub(/^[^#]*## /, "", text)
	for (k in val) {
		ref = "$(" k ")"
		while ((p = index(text, ref)) > 0) text = substr(text, 1, p - 1) val[k] substr(text, p + length(ref))
	}
	if (ng == 0) group[++ng] = "Targets"
	names[ng, ++count[ng]] = name
	texts[ng, count[ng]] = text
	if (length(name) > width) width = length(name)
}
END {
	print "usage: make TARGET [VAR=value …]"
	for (g = 1; g <= ng; g++) {
		printf "\n%s\n", group[g]
		for (i = 1; i <= count[g]; i++) printf "  %s  %s\n", sprintf("%-" width "s", names[g, i]), texts[g, i]
	}
}
