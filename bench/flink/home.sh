# bench/flink/home.sh — sourced by bench/flink/cluster.sh and scripts/bench-rescale-downtime.sh:
# assembles a Flink 2.3.0 home at $FH from the apache-flink and apache-flink-libraries wheels
# (downloaded once into $H/dl) and keeps the wheel's config as conf/config.yaml.orig.
# Expects H, FH and log().
if [ ! -f "$FH/lib/flink-dist-2.3.0.jar" ]; then
  log "assembling $FH from the apache-flink wheels"
  mkdir -p "$H/dl" "$FH"
  ls "$H"/dl/apache_flink_libraries-2.3.0-*.whl >/dev/null 2>&1 ||
    pip download --no-deps apache-flink-libraries==2.3.0 -d "$H/dl"
  ls "$H"/dl/apache_flink-2.3.0-*.whl >/dev/null 2>&1 ||
    pip download --no-deps apache-flink==2.3.0 -d "$H/dl"
  rm -rf "$H/libs" "$H/pyflink-wheel"
  unzip -q "$(ls "$H"/dl/apache_flink_libraries-2.3.0-*.whl | head -1)" \
    'pyflink/lib/*' 'pyflink/opt/*' 'pyflink/plugins/*' 'pyflink/bin/*' -d "$H/libs"
  unzip -q "$(ls "$H"/dl/apache_flink-2.3.0-*.whl | head -1)" 'pyflink/bin/*' 'pyflink/conf/*' -d "$H/pyflink-wheel"
  cp -r "$H/libs/pyflink/lib" "$H/libs/pyflink/opt" "$H/libs/pyflink/plugins" "$FH/"
  mkdir -p "$FH/bin"; cp "$H"/pyflink-wheel/pyflink/bin/* "$H"/libs/pyflink/bin/* "$FH/bin/"
  cp -r "$H/pyflink-wheel/pyflink/conf" "$FH/"; cp "$FH/conf/config.yaml" "$FH/conf/config.yaml.orig"
  chmod +x "$FH"/bin/*.sh "$FH/bin/flink"
fi
