#!/bin/sh
# Prints the reliability table the scenarios appended to (docs/reliability.md), aligned.
# Usage: scripts/reliability-table.sh [table.tsv]   (default .build/reliability/table.tsv)
# With TRIBUTARY_NO_SKIPS=1 (CI sets it) a skipped scenario (say, strace not allowed to inject faults
# here) fails: the run would otherwise pass without testing what the row names.
table="${1:-.build/reliability/table.tsv}"
if [ ! -s "$table" ]; then
  echo "reliability: no scenario ran (no $table)"
  # Under CI every scenario must have run: no table means none did.
  [ "${TRIBUTARY_NO_SKIPS:-0}" = 1 ] && exit 1
  exit 0
fi
echo
echo "Reliability scenarios (docs/reliability.md)"
awk -F'\t' '
  { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i] && i < NF) w[i] = length($i) } n = NF; rows = NR }
  END {
    for (r = 1; r <= rows; r++) {
      line = ""
      for (i = 1; i <= n; i++) {
        if (i == 1) line = sprintf("%-" w[i] "s", cell[r, i])
        else if (i < n) line = line "  " sprintf("%" w[i] "s", cell[r, i])
        else line = line "  " cell[r, i]
      }
      print line
      if (r == 1) { sep = ""; for (i = 1; i < n; i++) sep = sep sprintf("%" w[i] + 2 "s", ""); gsub(/ /, "-", sep); print sep "--------" }
    }
  }' "$table"
fails=$(awk -F'\t' 'NR > 1 && $NF ~ /^FAIL/' "$table" | wc -l)
skips=$(awk -F'\t' 'NR > 1 && $NF ~ /^skipped/' "$table" | wc -l)
echo "$(($(wc -l < "$table") - 1)) rows, $fails failed, $skips skipped"
if [ "${TRIBUTARY_NO_SKIPS:-0}" = 1 ] && [ "$skips" -gt 0 ]; then
  echo "reliability: $skips scenario(s) skipped, and TRIBUTARY_NO_SKIPS=1 asks for every one to run" >&2
  exit 1
fi
