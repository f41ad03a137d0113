# Sourced by scripts/test.sh: give the suite's Java virtual machines a class data sharing
# archive of Spark's classes (built on first use, into .venv), so that each of the suite's
# Spark starts maps those classes instead of reading, parsing and verifying them from the
# jars. A session's start on local[2] takes 5-6 s of CPU with it against 9-10 without, and
# the suite starts about twenty Spark JVMs. The archive is named after the Java and PySpark
# versions, so an upgrade of either builds a new one; a JVM whose class path does not match
# the archive's (or any other mismatch) runs without it, as before, and says nothing
# (-Xlog:cds*=off: the JVM's own logging goes to stdout, which some tests read).
# Usage: source scripts/spark_cds.sh   (after _setup.sh, with JAVA_TOOL_OPTIONS set)
georep_spark_cds() {
    local java_version pyspark_version archive
    command -v java >/dev/null 2>&1 || return 0
    java_version="$(env -u JAVA_TOOL_OPTIONS java -version 2>&1 | head -1 | tr -dc 'A-Za-z0-9._-')"
    pyspark_version="$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null)" || return 0
    archive="$PWD/.venv/spark-cds-${java_version}-${pyspark_version}.jsa"
    if [[ ! -f "$archive" ]]; then
        rm -f .venv/spark-cds-*
        # The driver's JVM dumps the classes it loaded when it exits; spark-submit returns
        # only then (a PySpark session started from Python lets its JVM exit after Python).
        if PATH="$PWD/.venv/bin:$PATH" PYSPARK_PYTHON="$PWD/.venv/bin/python" \
            SPARK_LOCAL_IP=127.0.0.1 timeout 300 .venv/bin/spark-submit --master 'local[2]' \
            --conf spark.ui.enabled=false --conf spark.driver.host=127.0.0.1 \
            --conf spark.driver.bindAddress=127.0.0.1 \
            --driver-java-options "-XX:ArchiveClassesAtExit=$archive.partial -Xlog:cds*=off" \
            scripts/_spark_cds_workload.py >/dev/null 2>&1 && [[ -s "$archive.partial" ]]; then
            mv "$archive.partial" "$archive"
        else
            rm -f "$archive.partial"
            echo "scripts/spark_cds.sh: no Spark class archive (the suite's Spark starts take longer)" >&2
            return 0
        fi
    fi
    export JAVA_TOOL_OPTIONS="$JAVA_TOOL_OPTIONS -XX:SharedArchiveFile=$archive -Xlog:cds*=off"
}
georep_spark_cds
