# Sourced by scripts/kafka-testenv.sh and scripts/flink-testenv.sh (which define `log` and
# `die`): fetches the runtime dependencies of a pom into a cache directory.
#
#   mvn_copy_dependencies WORK LIB CHECK
#
# runs `mvn dependency:copy-dependencies` on WORK/pom.xml into LIB.tmp (its log in WORK/mvn.log,
# the last 30 lines on stderr when it fails), checks that a jar matching CHECK (a glob, e.g.
# `kafka-clients-*.jar`) is there, then moves LIB.tmp to LIB and marks it `LIB/.complete`, so
# that an interrupted fetch is never taken for a complete one.
mvn_copy_dependencies() {
  local work=$1 lib=$2 check=$3
  rm -rf "$lib.tmp"
  (cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$lib.tmp" \
    -DincludeScope=runtime >"$work/mvn.log" 2>&1) ||
    {
      tail -n 30 "$work/mvn.log" >&2
      die "mvn dependency:copy-dependencies failed (log: $work/mvn.log)"
    }
  compgen -G "$lib.tmp/$check" >/dev/null || die "no $check in $lib.tmp"
  rm -rf "$lib"
  mv "$lib.tmp" "$lib"
  touch "$lib/.complete"
}
